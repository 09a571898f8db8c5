"""What the operator reads: a server, its children and pods, behind one interface (reader.py), from the
watch-fed copies (cache.py, fed by kopf indices and audited: kopfindex.py) or from the API server directly."""
