"""siglo-filestore: an example siglo backend keeping one JSON file per checkpoint."""

from siglo_filestore.store import FileStorageAdapter, connect, isolated

__all__ = ["FileStorageAdapter", "connect", "isolated"]
