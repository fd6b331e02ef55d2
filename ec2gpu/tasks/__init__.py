"""Task files: the model (spec), the loader (load), resources -> instance types (resolve), built-ins."""
