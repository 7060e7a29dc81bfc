"""tandem.codecs"""
