"""The model zoo (zoo.py), its runner against CPU (runner.py) and table (report.py)."""
