"""The ``tensorrt-llm-llmapi`` runtime: engine-free TensorRT-LLM through its LLM-API Triton model."""
