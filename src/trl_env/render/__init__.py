"""How text becomes tokens and back: processors, tool formats, sampled and deployed histories, env text, chats."""
