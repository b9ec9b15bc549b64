"""`overnight batches|files|keys`: the people's CLI, over HTTP with the official `openai` SDK."""

from app.client.commands import register

__all__ = ["register"]
