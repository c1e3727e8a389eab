"""Fake ``vllm.utils`` (tests/fakes): only ``cpu_triton_utils``."""
