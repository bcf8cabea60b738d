"""Chat: the library session that keeps a conversation's KV cache, and the terminal around it."""
