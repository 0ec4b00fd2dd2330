"""A plugin whose entry points give None instead of a VendorInfo."""

VENDOR = None


def make_vendor() -> None:
    """A factory that forgets to return its VendorInfo."""
