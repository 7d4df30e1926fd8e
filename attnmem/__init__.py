"""The `attnmem` command line and the Hugging Face Hub fetch shared with the pages."""
