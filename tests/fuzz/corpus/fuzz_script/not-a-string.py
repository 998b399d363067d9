requests
#int

print(2)
