"""optcheck: compare optimizer updates with closed-form expectations, torch.optim reference
trajectories and invariants (families in closed_form, torch_ref, invariants)."""
