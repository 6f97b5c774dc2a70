"""`make promote`: make a quantization run's candidate the LLM's model data, checked first."""
