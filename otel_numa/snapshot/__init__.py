"""One consistent view per collection: collectors re-read what changed, stages build the snapshot."""
