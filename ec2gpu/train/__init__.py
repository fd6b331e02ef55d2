"""The trainer shipped to instances: imports torch and numpy only, never boto3 or fabric."""
