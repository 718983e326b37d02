"""One module per language the text front end knows (see ``tts_bridge.text.language``)."""
