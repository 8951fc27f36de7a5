"""The processes that host the workflows and activities."""
