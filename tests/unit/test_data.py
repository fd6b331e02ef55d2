"""MNIST reading: md5 of the uncompressed content, clear errors for missing and corrupt files."""
import gzip

import pytest

from ec2gpu.train import data


def test_real_mnist_loads_with_expected_shapes_and_digests(mnist_dir):
    d = data.load(mnist_dir)
    assert d.train_images.shape == (60000, 28, 28) and d.test_images.shape == (10000, 28, 28)
    assert d.md5 == {name: md5 for name, (_, md5) in data.FILES.items()}


def test_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(data.DataError, match="does not exist"):
        data.load(tmp_path / "nope")


def test_missing_file_names_the_file(tmp_path):
    with pytest.raises(data.DataError, match="train-images-idx3-ubyte"):
        data.load(tmp_path)


def test_corrupt_file_is_detected_by_md5(tmp_path, mnist_dir):
    data.copy_to(tmp_path, mnist_dir)
    with gzip.open(tmp_path / "t10k-labels-idx1-ubyte.gz", "wb") as f:
        f.write(b"\x00\x00\x08\x01\x00\x00\x00\x02\x07\x02")
    with pytest.raises(data.DataError, match="corrupt"):
        data.load(tmp_path)


def test_read_idx_rejects_size_mismatch():
    with pytest.raises(data.DataError):
        data.read_idx(b"\x00\x00\x08\x01\x00\x00\x00\x05\x01")
