"""Campaign scripts: the exact runs behind the committed traces/ data, re-runnable on any GPU host."""
