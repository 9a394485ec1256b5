"""One Hugging Face checkpoint, read without loading it: its config, safetensors headers and tokenizer files."""
