"""optcheck: compare optimizer updates with closed forms and torch.optim (not implemented yet)."""
