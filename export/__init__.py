"""``python -m export``: package a trained checkpoint as a self-contained folder and push it to the Hugging Face Hub."""
