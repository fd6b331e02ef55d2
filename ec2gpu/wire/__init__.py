"""Records that cross the wire between the controller and an instance, and the one bounded JSON reader (bounded_json.py)."""
