"""Porter plugin for CogVideoX.

Installed and discovered like every plugin; its model family is not written
yet, so it registers nothing (``porter plugins`` shows that).
"""
