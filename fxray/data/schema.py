"""The fxcache's columns in one place: widths, the order-flow names, where ADX sits.

The 42 feature names (and their formulas) are in fxray.data.features; the format
itself (Arrow types, metadata) in fxray.data.cache.
"""

N_FEATURES = 42  # width of `features`
N_OFI = 8  # width of `ofi`
ADX_INDEX = 40  # features[:, 40] = ADX(14)
# features[:, 34:38] = tod_sin, tod_cos, dow_sin, dow_cos: the clock (with dqn.inputs: ridge the
# only inputs training noise reaches: the front end's predictions read clean; fxray.rl.frontend)
CALENDAR_INDICES = (34, 35, 36, 37)
TARGET_NAMES = ("open", "high", "low", "close")  # `targets`, in this order
# the order-book features' names (fxray.book.features computes them); bar-only caches
# carry zeros under the same names, so zero and real columns are named alike
OFI_NAMES = ("ofi_l1", "mlofi_5", "depth_imb_5", "vpin", "kyle_lambda", "bid_slope", "ask_slope", "trade_imb")
