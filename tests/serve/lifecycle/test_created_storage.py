"""serve/lifecycle/created.py on a full disk: an uploaded blob that does not fit is StorageFull (a 507 at the
HTTP boundary) and leaves no partial blob; with room again the same upload is kept."""
import hashlib
import os

import pytest

from serve.lifecycle.created import ModelStore
from strata_control.files import StorageFull


def test_a_blob_on_a_full_disk_is_storage_full_and_leaves_nothing(small_disk):
    store = ModelStore(small_disk.path)
    data = os.urandom(64 << 10)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    small_disk.fill()

    def read_into(sink):
        for i in range(0, len(data), 4096):
            sink(data[i:i + 4096])
        return len(data)
    with pytest.raises(StorageFull, match="No space left on device"):
        store.write_blob(digest, read_into)
    assert os.listdir(store.blobs_dir) == [] and not store.has_blob(digest)
    small_disk.free()
    assert store.write_blob(digest, read_into) == len(data) and store.has_blob(digest)
