"""Hand-built multipart bodies, for the shapes curl and other clients send."""

from dataclasses import dataclass

BOUNDARY = "----overnight-test-boundary"


@dataclass(frozen=True)
class Part:
    name: str
    data: bytes
    filename: bytes | None = None  # raw bytes: tests send names no library would encode
    content_type: str | None = None


def multipart(*parts: Part, boundary: str = BOUNDARY, close: bool = True) -> bytes:
    """The body; `close=False` leaves out the closing boundary (a truncated upload)."""
    out = bytearray()
    for part in parts:
        out += f"--{boundary}\r\n".encode()
        disposition = f'Content-Disposition: form-data; name="{part.name}"'.encode()
        if part.filename is not None:
            disposition += b'; filename="' + part.filename + b'"'
        out += disposition + b"\r\n"
        if part.content_type:
            out += f"Content-Type: {part.content_type}\r\n".encode()
        out += b"\r\n" + part.data + b"\r\n"
    if close:
        out += f"--{boundary}--\r\n".encode()
    return bytes(out)


def content_type(boundary: str = BOUNDARY) -> dict[str, str]:
    return {"Content-Type": f"multipart/form-data; boundary={boundary}"}


# curl -H 'Content-Type: application/json': an open deployment takes JSON bodies only so.
JSON_TYPE = {"Content-Type": "application/json"}
