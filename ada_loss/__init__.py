"""ada_loss."""
