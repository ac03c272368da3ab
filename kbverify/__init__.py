"""kbverify: is this kernel really correct, really faster, by how much, and how sure are we?"""

__version__ = "0.1.0"
