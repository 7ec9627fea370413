"""Status has one writer: patches are built here (``status_patch``), recorded before anything is applied
(``status_write``), and announced as events (``events``)."""
