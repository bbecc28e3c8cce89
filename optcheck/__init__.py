"""optcheck: compare optimizer updates with closed-form expectations, torch.optim trajectories
and invariants (the families closed_form, torch_trajectories, invariants; the float64 numpy
optimizers of numpy_optimizers as a third opinion)."""
