"""What a server client may give as an image (porter.commands.serve.uploads), and how deep a request
body may nest (porter.commands.serve.limits.nesting): no server needed."""

import base64
import io
import json
import os

import pytest
from PIL import Image

from porter.commands.serve import uploads
from porter.commands.serve.limits import nesting
from porter.errors import UsageError


def png(size=(8, 8), color=(200, 30, 30)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return buffer.getvalue()


def data_url(data: bytes, kind="image/png") -> str:
    return f"data:{kind};base64," + base64.b64encode(data).decode()


@pytest.fixture
def inputs(tmp_path):
    """An inputs folder with one image, a link out of it, and a secret image beside it."""
    folder = tmp_path / "inputs"
    (folder / "sub").mkdir(parents=True)
    (folder / "frame.png").write_bytes(png())
    (folder / "sub" / "deep.png").write_bytes(png(color=(1, 2, 3)))
    (tmp_path / "secret.png").write_bytes(png(color=(9, 9, 9)))
    (folder / "out.png").symlink_to(tmp_path / "secret.png")
    (folder / "outdir").symlink_to(tmp_path)
    (folder / "notes.txt").write_text("not an image")
    return folder


def refusal(settings, inputs=None) -> str:
    with pytest.raises(UsageError) as caught:
        uploads.take(settings, inputs)
    return caught.value.message


def test_an_image_sent_as_a_data_url_is_taken_as_its_bytes():
    data = png()
    assert uploads.take({"image": data_url(data), "prompt": "x"}, None) == {
        "image": (data, ".png")}
    jpeg = io.BytesIO()
    Image.new("RGB", (8, 8)).save(jpeg, format="JPEG")
    # the declared type is not trusted: the bytes say what the image is
    assert uploads.take({"last_image": data_url(jpeg.getvalue(), "image/png")},
                        None)["last_image"][1] == ".jpg"


@pytest.mark.parametrize("path", ["/etc/passwd", "/etc/shadow", "/proc/self/environ",
                                  "../../etc/passwd", "frame.png"])
def test_without_an_inputs_folder_no_path_is_read(path, monkeypatch):
    opened = []
    monkeypatch.setattr(os, "open", lambda *a, **k: opened.append(a) or 1 / 0)
    assert "reads no file a request names" in refusal({"image": path})
    assert opened == []


def test_files_in_the_inputs_folder_are_read(inputs):
    assert uploads.take({"image": "frame.png"}, inputs)["image"] == (
        (inputs / "frame.png").read_bytes(), ".png")
    assert uploads.take({"image": "sub/../sub/deep.png"}, inputs)["image"][0] == (
        inputs / "sub" / "deep.png").read_bytes()


@pytest.mark.parametrize("name", [
    "/etc/passwd", "../secret.png", "sub/../../secret.png", "out.png", "outdir/secret.png",
    str("{inputs}/../secret.png"), "missing.png", "/proc/self/environ", "a\0b", "x" * 5000,
    "sub", ""])
def test_nothing_outside_the_inputs_folder_is_read_and_every_refusal_reads_alike(
        inputs, name):
    message = refusal({"image": name.replace("{inputs}", str(inputs))}, inputs)
    # one answer for a missing file, a folder, and a file that exists outside:
    # a client learns nothing about the server's disk
    assert message.startswith("image: no image file ") and "in this server's inputs " \
        "folder" in message


def test_what_is_not_a_readable_image_is_refused(inputs, tmp_path):
    assert "not an image" in refusal({"image": "notes.txt"}, inputs)
    assert "not an image" in refusal({"image": data_url(b"<html>not found</html>")})
    assert "not an image" in refusal({"image": data_url(png((64, 64))[:-40])})  # cut
    assert "does not decode" in refusal({"image": "data:image/png;base64,@@@@"})
    assert "expected a string" in refusal({"image": {"path": "/etc/passwd"}})
    big = os.urandom(uploads.MAX_IMAGE_BYTES + 10)
    assert "larger than" in refusal({"image": data_url(big)})
    (inputs / "big.png").write_bytes(big)
    assert "larger than" in refusal({"image": "big.png"}, inputs)
    wide = io.BytesIO()
    Image.new("1", (9000, 9000)).save(wide, format="PNG")  # a small file, many pixels
    assert "pixels" in refusal({"image": data_url(wide.getvalue())})


def test_a_fifo_in_the_inputs_folder_is_refused_without_blocking(inputs):
    os.mkfifo(inputs / "pipe.png")
    assert "no image file" in refusal({"image": "pipe.png"}, inputs)


@pytest.mark.parametrize("body,depth", [
    (b'{"prompt": "x"}', 1), (b'{"extra": {"a": [1, [2]]}}', 4),
    (b'{"prompt": "[[[[{{{{"}', 1), (b'{"prompt": "\\\\\\"[[[["}', 1),
    (b'{"prompt": "\\\\"}', 1), (b"[" * 100_000, 33), (b'{"a":' * 100_000, 33)])
def test_nesting_is_counted_outside_strings_and_no_deeper_than_asked(body, depth):
    assert nesting(body, 32) == depth
    if depth <= 32:
        assert json.loads(body) is not None


def test_a_camera_jpeg_is_taken():
    """Phones and cameras write JPEGs with an MPF marker, which PIL names MPO."""
    buffer = io.BytesIO()
    frames = [Image.new("RGB", (8, 8), c) for c in ((1, 2, 3), (4, 5, 6))]
    frames[0].save(buffer, format="MPO", save_all=True, append_images=frames[1:])
    assert Image.open(io.BytesIO(buffer.getvalue())).format == "MPO"
    assert uploads.take({"image": data_url(buffer.getvalue(), "image/jpeg")},
                        None)["image"][1] == ".jpg"


def mp4(frames=3) -> bytes:
    import numpy as np

    from porter.rundir.video import encode_mp4

    return encode_mp4(np.full((frames, 16, 16, 3), 90, np.uint8), fps=8)


def test_a_video_is_taken_for_the_keys_that_take_videos(inputs):
    data = mp4()
    assert uploads.take({"video": data_url(data, "video/mp4")}, None) == {
        "video": (data, ".mp4")}
    (inputs / "clip.mp4").write_bytes(data)
    assert uploads.take({"control_video": "clip.mp4"}, inputs)["control_video"][1] == ".mp4"
    # a mask is an image or a video
    assert uploads.take({"mask": data_url(png())}, None)["mask"][1] == ".png"
    assert uploads.take({"mask": "clip.mp4"}, inputs)["mask"][1] == ".mp4"


def test_what_is_not_a_readable_video_is_refused(inputs):
    assert "not a video" in refusal({"video": data_url(png())})  # an image is no video
    assert "not a video" in refusal({"video": data_url(mp4()[:200])})  # cut
    assert "not an image" in refusal({"image": data_url(mp4(), "video/mp4")})
    assert "no video file" in refusal({"video": "../secret.png"}, inputs)
    big = os.urandom(uploads.MAX_VIDEO_BYTES + 10)
    assert "larger than 64 MiB" in refusal({"video": data_url(big)})


@pytest.mark.parametrize("key, value", [("conditions", [{"frames": "/etc/passwd"}]),
                                        ("reference_conditions", [{"frames": "a.png"}]),
                                        ("latents", "/root/latents.safetensors")])
def test_settings_that_name_paths_are_refused(key, value, inputs):
    """Condition objects and latents name their files by path: a request cannot."""
    assert "a request cannot set it" in refusal({key: value}, inputs)
