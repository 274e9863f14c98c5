"""The agents' language models: the transformers backend, LoRA adapters on a shared base, the tokenizer made in process, bases per role, the memory plan and FLOPs accounting."""
