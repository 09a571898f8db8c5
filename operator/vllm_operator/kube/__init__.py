"""The base every runtime package stands on: the Kubernetes API client, its errors, plurals and Events."""
