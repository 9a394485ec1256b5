"""The compile pipeline's machinery: stages skipped when their inputs hash as last time, outputs written whole
(atomic folders and files), and the content hashes both rest on."""
