"""Tools for your own model: verify the window against the large batch, plan B, K and the structure."""
