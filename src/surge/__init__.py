"""surge: Ray Serve's API on a data path built for cliff-shaped traffic pulses.

    from surge import serve
"""

from surge import serve

__all__ = ["__version__", "serve"]
__version__ = "0.1.0"
