"""`interceptor view RUN_DIR_OR_FILE`: a local web page over a run's records and training metrics.

`index` follows the record and metrics files, `query` answers the table and summary, `detail` turns one record
into the conversation and its token spans, `app` serves them, `static/` is the page. `main` is the command.
"""
