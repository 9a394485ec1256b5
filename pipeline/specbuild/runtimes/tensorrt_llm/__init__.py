"""The ``tensorrt-llm`` runtime: TensorRT-LLM 1.2.x engines on Triton's ``tensorrtllm`` backend."""
