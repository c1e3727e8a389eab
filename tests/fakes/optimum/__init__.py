"""A fake optimum (only ``optimum.commands.optimum_cli``) for tests/test_openvino_worker.py."""
