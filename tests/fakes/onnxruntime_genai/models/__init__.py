"""The fake ``onnxruntime_genai.models`` package: ``builder`` is the fake model builder."""
