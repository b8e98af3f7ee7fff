"""Built-in detectors, one module each. Every module defines one ``Detector`` subclass with a stable ``id``."""
