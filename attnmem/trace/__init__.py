"""The torch side of calc: real transformers models built on the meta device (no memory, no
weights), read for what calc's hand rules would otherwise have to know. ``weights``: every
parameter and buffer of any architecture transformers builds. Importing this package imports
neither torch nor transformers; its functions do.
"""
