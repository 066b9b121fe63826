"""Order books and trade tapes from real feeds (Databento DBN, Binance depth) -> the fxcache's
8 order-flow columns. Imports fxray.data only; the entry points are in fxray.book.reader."""
