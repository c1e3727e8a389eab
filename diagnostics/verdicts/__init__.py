"""The losslessness verdict table of real engines (``python -m diagnostics verdicts``)."""
