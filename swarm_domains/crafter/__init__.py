"""The Crafter domain (Hafner 2021): Crafter's own worlds, in text, with roles, an executor and its score."""
