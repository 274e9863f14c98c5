"""Plugins: the hook specifications, the plugin manager and registries, and the core's own built-in registrations."""
