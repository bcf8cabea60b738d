"""Models: the curated registry, the Hub and its mirror, the caches and other tools' stores on
disk, and the search for a draft that fits a target."""
