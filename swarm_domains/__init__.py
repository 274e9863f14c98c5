"""Built-in domain plugins; they register through the public hooks like any third-party plugin."""
