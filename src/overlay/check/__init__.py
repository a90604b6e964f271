"""`overlay check`: stock vs patched engines, side by side."""
