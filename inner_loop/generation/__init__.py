"""How a member generates its completions: which backend (HF generate, transformers continuous batching, vLLM),
and the memory each may take for its cache, sized from the member's own allocation."""
