"""Shared test setup: never reach the Hub, keep nvkit's caches inside the test run."""

import os

# Set before anything imports transformers/huggingface_hub (they read it at import time).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
