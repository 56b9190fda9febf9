"""PyTorch's OpInfo database run on the tpu device against CPU (see harness.py, report.py)."""
