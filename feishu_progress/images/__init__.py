"""Where card images may come from (a confined local root, SSRF-guarded URLs) and their bounded uploads."""

from feishu_progress.images.fetch import AddressPolicy, ImageFetcher
from feishu_progress.images.local import LocalImages
from feishu_progress.images.sniff import require_image, sniff_image_type
from feishu_progress.images.uploads import ImageClient, ImageUploads

__all__ = [
    "AddressPolicy",
    "ImageClient",
    "ImageFetcher",
    "ImageUploads",
    "LocalImages",
    "require_image",
    "sniff_image_type",
]
