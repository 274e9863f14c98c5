"""Cross-cutting plugins (loggers, scale-out) and an example third-party package."""
