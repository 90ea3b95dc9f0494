"""The dashboard's pages and actions, one module per page (`base` holds what they share)."""
