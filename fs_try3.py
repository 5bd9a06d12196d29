from napkin_cat import certify
for box, axis in certify.representative_boxes():
    if box.op=='ncontract':
        print(box.params, certify.accumulator(box, axis, 'normalised', True))
