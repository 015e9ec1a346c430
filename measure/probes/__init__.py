"""Small measurement probes the lead runs on a GPU machine (each writes one JSON)."""
